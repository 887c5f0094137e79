"""governord: the strict authority of ratemesh (engine, durable store, and their driver)."""
