"""Where record bytes come from.  A backend turns a read plan into the assembled image."""
