"""Speculative decoding: proposers draft, one target forward verifies, the longest prefix stays.

``speculator`` runs a step (propose -> verify -> accept) inside continuous batching; ``registry``
builds the proposer each method names (``ngram``, ``draft_model``, ``redrafter``); ``verify``
holds the pure acceptance rules; ``stats`` the acceptance counters.
"""
