"""Serving a placement for real: the live server, its workers, the HTTP endpoint in front of it,
and the measurements of this machine the serving simulator reads."""
