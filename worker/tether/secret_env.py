"""The environment variables a Tether process reads its own secrets from, whatever the spec
says (the spec's own are `DurableAgentSpec.secret_variables`): never handed to a tool, never
shown in a log."""

NOTIFY_URL_ENV = "TETHER_NOTIFY_URL"
"""Where the worker reads the notify URL from by default (the operator maps the Secret there)."""
PREVIOUS_SECRET_ENV = "TETHER_WEBHOOK_SECRET_PREVIOUS"
"""During a rotation of the webhook secret, the key being replaced: accepted, never signing."""
SLACK_SIGNING_SECRET_ENV = "TETHER_SLACK_SIGNING_SECRET"
"""Where the sidecar reads the Slack app's signing secret (the operator maps the Secret of
`approvals.notify.slackSigningSecretRef` there, into the sidecar only)."""
WORKER_SECRET_ENV = (
    "TETHER_WEBHOOK_SECRET",
    PREVIOUS_SECRET_ENV,
    SLACK_SIGNING_SECRET_ENV,
    NOTIFY_URL_ENV,
    "ANTHROPIC_API_KEY",
    "OPENAI_API_KEY",
    "TETHER_MODEL_API_KEY",
)
