"""Reading pages: the exposition format, and what each GPU exporter, inference server and gateway shows."""
