"""The agent daemon: local training, the link to the coordinator."""
