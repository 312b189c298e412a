"""Route mixins of the Ingress, one module per area of llama-server's API.

Each mixin registers its methods on ``deployments.serve.app.app`` and uses the state that
``deployments.serve.ingress.IngressBase`` holds (handles, vocabulary, arguments, defaults).
"""
