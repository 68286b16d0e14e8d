"""Stream processors: the pure fold and the Kafka/Faust edges around it."""
