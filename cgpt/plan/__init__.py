"""`cgpt plan`: what a run will do on given devices, from the resolved run and the compiled step."""
