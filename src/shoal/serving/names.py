"""The names a user picks among for serving: placers, the auto placer's objectives, routers and
simulation modes.

Plain tuples with no imports, so that the command line lists the choices without loading the
placers or the simulator (numpy, networkx). ``placers`` and ``routing`` take theirs from here.
Each is in the order the command line offers it.
"""

PLACERS = ("auto", "milp", "swarm", "petals", "separate")
OBJECTIVES = ("max-flow", "decode")  # auto's; decode is the default where the nodes have layer times
ROUTERS = ("iwrr", "helix-iwrr", "swarm", "random", "shortest-queue")
MODES = ("offline", "online")  # offline: the cluster kept busy; online: requests at their arrivals
