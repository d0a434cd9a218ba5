package io.streamops.hadoop;

import java.io.IOException;
import java.net.URI;
import java.net.URISyntaxException;

import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.DelegateToFileSystem;
import org.apache.hadoop.fs.FsConstants;
import org.apache.hadoop.fs.FsServerDefaults;
import org.apache.hadoop.fs.Path;

/**
 * The FileContext binding of {@link NioRawLocalFileSystem} (set as
 * {@code fs.AbstractFileSystem.file.impl}), as Hadoop's RawLocalFs binds RawLocalFileSystem:
 * Spark's checkpoint file manager writes through FileContext.
 */
public class NioLocalFs extends DelegateToFileSystem {
  public NioLocalFs(URI theUri, Configuration conf) throws IOException, URISyntaxException {
    super(theUri, new NioRawLocalFileSystem(), conf, FsConstants.LOCAL_FS_URI.getScheme(), false);
  }

  @Override
  public int getUriDefaultPort() {
    return -1; // no default port for file:///
  }

  @Override
  public FsServerDefaults getServerDefaults(Path f) throws IOException {
    return fsImpl.getServerDefaults(f);
  }

  @Override
  @Deprecated
  public FsServerDefaults getServerDefaults() throws IOException {
    return fsImpl.getServerDefaults();
  }

  @Override
  public boolean isValidName(String src) {
    return true; // as RawLocalFs: the operating system decides
  }
}
