"""The trainer: consumes windows of (prompt, response, reward) triplets, updates the policy, publishes each new
version as a resources-published event."""
