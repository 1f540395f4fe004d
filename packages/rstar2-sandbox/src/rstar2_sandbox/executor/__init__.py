"""Fork-server executor: a pool of pre-warmed processes that fork one confined child per run."""
