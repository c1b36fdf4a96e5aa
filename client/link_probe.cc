// Nothing of its own: client/CMakeLists.txt links ckpt_client into this
// library with --no-as-needed so that its DT_NEEDED entries show every
// shared library libckpt's link interface brings
// (LibckptLinksNoObjectStoreStack).
int ckpt_link_probe() { return 0; }
