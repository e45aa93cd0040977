"""shoal: plan, estimate, run and re-plan LLM training and serving on mixed, scattered GPU pools."""
