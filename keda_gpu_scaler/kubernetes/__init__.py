"""Kubernetes discovery: ScaledObject → scale target → pods, trigger metricType, and the exporters to scrape."""
