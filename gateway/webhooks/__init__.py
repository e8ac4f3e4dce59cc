"""Webhooks (docs/doors/webhooks.md): chosen catalog events POSTed, signed, at least once.

- gateway.webhooks.signing: the Standard Webhooks headers of one delivery;
- gateway.webhooks.delivery: the node's delivery loop over the store's outbox
  (gateway.store.outbox), in event order per session and webhook.
"""
