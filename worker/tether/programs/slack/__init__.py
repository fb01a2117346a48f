"""Slack's side of approvals (`approvals.notify.format: slack`), shared by the worker, which
posts a parked call as a Block Kit message with Approve and Deny buttons to an incoming
webhook, and the sidecar, which takes the clicks Slack sends it (`/v1/slack/interactions`):

- `signing`: Slack's request signatures, and the tokens the buttons carry;
- `messages`: the messages (the approval, the decision that replaces its buttons, replies).

Standard library only: the worker and the sidecar each bring their own HTTP client.
"""
