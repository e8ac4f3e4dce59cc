"""The load-test harness: the gateway against its peers, measured from outside (bench/README.md)."""
