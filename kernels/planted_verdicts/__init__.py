"""Planted verdicts: attention variants wrong or slow in known ways, to check what microscope concludes."""
