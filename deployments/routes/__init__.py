"""Route mixins of the Ingress, one module per area of llama-server's API.

Each mixin registers its methods on ``deployments.app.app`` and uses the state that
``deployments.ingress.IngressBase`` holds (handles, vocabulary, arguments, defaults).
"""
