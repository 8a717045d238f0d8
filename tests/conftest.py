"""Suite-wide settings: hypothesis runs derandomized so that every CI run sees the same examples."""

from hypothesis import settings

settings.register_profile("kvtune", derandomize=True, deadline=None, print_blob=True)
settings.load_profile("kvtune")
