from skyfed.coordinator.cli import main

main()
