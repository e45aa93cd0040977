"""Availability over time: traces, switch costs, re-planning, policies, replay."""
