"""What the benchmarks share: the machine a run measured on (machine.py), the result set a run
writes with its manifest (resultset.py), the paper's workloads (paper.py) and the network model of
a client's round trips (netsim.py)."""
