"""The Ray Serve graph: ingress (HTTP, validation) -> response shaper -> model replica (engine)."""
