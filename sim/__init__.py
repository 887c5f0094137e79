"""A deterministic fleet simulator: the real mesh core on a virtual clock, beside the
strategies users pick today, on the same workload, network and faults, from one seed."""
