"""The ground floor: what capture, predictors, policies and the simulator all stand on.

The trace contract (``trace``), atomic writes and the data and cache folders (``io``), rank and
error metrics (``metrics``), the ridge read-out of output length (``readout``), the serving GPU's
and model's constants (``hardware``) and arrival-time inputs (``arrivals``). Nothing here imports
another package of the project.
"""
