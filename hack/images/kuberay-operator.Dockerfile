# The KubeRay operator image from the binary hack/testenv/build.sh built from
# KubeRay's Go module (its own Dockerfile compiles inside a golang image, which cannot
# be pulled here). Same entrypoint and non-root user as KubeRay's published image.
FROM scratch
COPY kuberay-operator /manager
USER 65532:65532
ENTRYPOINT ["/manager"]
