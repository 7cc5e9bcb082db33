package incus

// OwnerOf is b's mark on the layer images it makes, for the tests.
func OwnerOf(b *Backend) string { return b.owner }
