"""`python -m approval_broker`: the `approval-broker` command."""

from approval_broker.cli import main

main()
