"""leap-sched's import namespace for deployable integrations (``leap_sched.vllm``: LEAP in ``vllm serve``).

The project's own modules keep their top-level names (``live``, ``policies``, ...); the class paths a
user types into another program's flags live here, under the distribution's name, so they cannot
collide with another package's top-level module.
"""
