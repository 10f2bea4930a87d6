from skyfed.certs.cli import main

main()
