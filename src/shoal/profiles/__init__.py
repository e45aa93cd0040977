"""How fast each layer runs on each GPU, how much it stores, and how fast each link moves bytes."""
