"""The wire: Ebbtide's event model, Kafka consumers and producers, recordings, the embedded broker.

The only package that imports aiokafka. It knows nothing of policies or clusters.
"""
