"""The MLX engine: model loading, continuous-batching scheduler, sampling, stop rules, caches.

Plain Python and MLX; nothing here imports Ray or knows llama-server's JSON.
"""
