"""SimPy replay simulator of a vLLM-like serving engine: trace contract, engine, profiles, CLI."""
