"""jbert's version, in a module of its own: a file that records it (a saved model's config) need not import the
package's lazy public names."""
__version__ = "0.1.0"
