"""Kafka access: cluster metadata through the admin client, and offset-range reads in Spark tasks."""
