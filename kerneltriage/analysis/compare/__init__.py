"""Reports set against each other: two runs (diff) and the ranks of one job."""
