"""The kopf operator for DurableAgent resources (built under the Kubernetes issue)."""
