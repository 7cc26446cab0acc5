// The pod sandbox's pause process for the e2e nodes' images (e2e/hack/build-images.sh).

module switchyard.dev/e2e/pause

go 1.26.0
