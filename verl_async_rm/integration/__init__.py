"""verl integration: the ``async_agent`` reward manager and its registration."""
