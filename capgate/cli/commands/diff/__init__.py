"""``capgate diff``: which decisions a policy or catalogue change flips (``command``)."""
