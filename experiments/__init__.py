"""The top floor: the command lines and what they make of many runs (sweeps, the report, plots,
the golden figures, validation against recordings, rebuilt steps tables). It stands above the
simulator, the predictors and capture, and nothing below imports it."""
