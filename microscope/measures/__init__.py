"""One module per dimension. Each returns plain results; the runner turns them into records."""
