"""The names a user picks among for training: search strategies, objectives and the schedules of
pipelines over the WAN.

Plain tuples with no imports, so that the command line lists the choices without loading the
planners. ``planners.STRATEGIES`` maps each strategy name to its code (a test checks the two
agree); ``planners.common`` and ``geo`` check names against these.
"""

STRATEGY_NAMES = ("auto", "sailor", "espresso", "zorse", "atlas", "exhaustive")
OBJECTIVES = ("max-throughput", "min-cost", "max-throughput-per-dollar")
GEO_SCHEDULES = ("atlas", "varuna", "1f1b", "gpipe")  # geo.simulate's; atlas, the default, first
