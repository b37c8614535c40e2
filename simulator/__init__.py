"""SimPy replay simulator of a vLLM-like serving engine: engine, profiles, workload and one run."""
