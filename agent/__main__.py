from skyfed.agent.cli import main

main()
