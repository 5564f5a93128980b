# Traefik, the node tier's Gateway API implementation, from the binary
# hack/testenv/build.sh built from Traefik's Go module (its published image cannot be
# pulled here). Same entrypoint as the published image, run as a non-root user; the pod
# lets it bind port 80 (node/gateway.py), which KubeRay's Gateways listen on.
FROM scratch
COPY traefik /traefik
USER 65532:65532
ENTRYPOINT ["/traefik"]
