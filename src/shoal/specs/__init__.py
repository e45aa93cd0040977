"""What the user describes: model, job, pool, network, prices, objective, constraints, plans."""
