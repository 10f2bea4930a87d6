from skyfed.cli import main

main()
