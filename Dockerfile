# One image for every litstream role (lifecycle, span-sink, gateway, runner,
# topics); the role is chosen by the command, e.g.
#   docker run --rm litstream:latest process lifecycle
#
# Two stages: the package is installed into a virtualenv in a throwaway stage
# that may carry a compiler, and only that virtualenv (no compiler, no source
# tree) is copied into the runtime image.

ARG PYTHON_IMAGE=python:3.11-slim

FROM ${PYTHON_IMAGE} AS build

# Extras of the package to install: "train" brings torch and transformers (trainer, runners with the torch
# engine). TORCH_INDEX picks torch's build: the CPU index by default; set it to a CUDA index for GPU hosts.
ARG EXTRAS=train
ARG TORCH_INDEX=https://download.pytorch.org/whl/cpu

# A compiler for dependencies without a wheel for the build platform (e.g.
# faust-streaming has none for arm64). Unpinned: this stage is discarded, and
# pins would break on every Debian point release.
# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends build-essential \
 && rm -rf /var/lib/apt/lists/*

ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1
RUN python -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH

WORKDIR /src

# Dependencies first, read from pyproject.toml alone: this layer is rebuilt
# only when the dependency list changes, not on every source edit.
COPY pyproject.toml ./
RUN python -c "import tomllib, os; p = tomllib.load(open('pyproject.toml', 'rb'))['project']; extras = [e for e in os.environ.get('EXTRAS', '').split(',') if e]; deps = p.get('dependencies', []) + [d for e in extras for d in p['optional-dependencies'][e]]; open('/tmp/requirements.txt', 'w').write(''.join(d + '\n' for d in deps))" \
 && if [ -s /tmp/requirements.txt ]; then pip install --no-cache-dir --extra-index-url "$TORCH_INDEX" -r /tmp/requirements.txt; fi

# Then the sources (filtered by .dockerignore) and the package itself.
COPY . .
RUN pip install --no-cache-dir --extra-index-url "$TORCH_INDEX" ".${EXTRAS:+[$EXTRAS]}" \
 && litstream --help > /dev/null


FROM ${PYTHON_IMAGE} AS runtime

LABEL org.opencontainers.image.title="litstream" \
      org.opencontainers.image.description="Event-sourced agent-RL control plane on Kafka"

ENV PATH=/opt/venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    LITSTREAM_DATA_DIR=/var/lib/litstream

# Fixed numeric uid/gid so orchestrators can verify runAsNonRoot and volume
# ownership is predictable.
RUN groupadd --system --gid 10001 litstream \
 && useradd --system --uid 10001 --gid litstream --no-create-home \
      --home-dir /var/lib/litstream --shell /usr/sbin/nologin litstream \
 && install -d -o litstream -g litstream -m 0750 /var/lib/litstream

COPY --from=build /opt/venv /opt/venv

WORKDIR /var/lib/litstream
USER 10001:10001

ENTRYPOINT ["litstream"]
CMD ["--help"]
