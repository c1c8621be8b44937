"""Controllers a learned one is judged against: static, random, grow_all and fixed plans, the heuristic."""
