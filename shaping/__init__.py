"""Link shaping with Linux tc through pyroute2: units, qdisc plans, ownership, verification."""
