"""Training: plans' schedules (event simulation); planners come here."""
