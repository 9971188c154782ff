"""A lab for tests and benchmarks: links with delay, bandwidth, partitions and resets between parties in their
own network namespaces, and volumes that fill up. The parties never import it."""
