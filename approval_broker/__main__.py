from approval_broker.cli import main

main()
