# One image for every process of Tether: the worker (`tether worker`), its sidecar
# (`tether sidecar`) and the operator (`tether-operator`). Non-root, no shell tools needed at
# run time; mount the manifest at /etc/tether/agent.yaml and writable emptyDirs at /tmp,
# /workspace and /var/run/tether/metrics (the root filesystem can stay read-only).
# PYTHON_IMAGE exists for machines that cannot pull: the e2e builds against a stand-in made from
# Debian packages (scripts/build-images.sh). Everyone else builds FROM python:3.11-slim.
ARG PYTHON_IMAGE=python:3.11-slim

FROM ${PYTHON_IMAGE} AS build
WORKDIR /src
# The dependencies first, in a layer of their own (their compatible ranges are pinned in
# pyproject.toml), so a change to the code rebuilds only the last layer: seconds, not a minute.
COPY pyproject.toml ./
RUN python -c "import tomllib; p = tomllib.load(open('pyproject.toml', 'rb'))['project']; \
    extras = p['optional-dependencies']; \
    names = ['anthropic', 'openai', 'restate', 'sidecar', 'operator', 'mcp', 'otel']; \
    print('\n'.join(p['dependencies'] + [r for name in names for r in extras[name]]))" \
    > requirements.txt \
 && pip install --no-cache-dir --prefix=/deps -r requirements.txt
COPY README.md ./
COPY worker worker
COPY operator operator
# hadolint ignore=DL3013
RUN pip install --no-cache-dir --prefix=/app --no-deps .

FROM ${PYTHON_IMAGE}
RUN useradd --uid 65532 --user-group --no-create-home --shell /usr/sbin/nologin tether
COPY --from=build /deps /usr/local
COPY --from=build /app /usr/local
ENV PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    HOME=/tmp \
    TETHER_WORKSPACE=/workspace
USER 65532:65532
EXPOSE 9080 8000
ENTRYPOINT ["tether"]
CMD ["worker", "--spec", "/etc/tether/agent.yaml"]
