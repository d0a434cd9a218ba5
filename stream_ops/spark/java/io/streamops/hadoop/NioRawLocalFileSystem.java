package io.streamops.hadoop;

import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.attribute.PosixFilePermission;
import java.util.EnumSet;
import java.util.Set;

import org.apache.hadoop.fs.FileStatus;
import org.apache.hadoop.fs.Path;
import org.apache.hadoop.fs.RawLocalFileSystem;
import org.apache.hadoop.fs.permission.FsPermission;

/**
 * Hadoop's local file system without forked commands: permissions set and symbolic links
 * detected with java.nio.
 *
 * <p>Without Hadoop's native library (pyspark ships none), RawLocalFileSystem runs the
 * chmod command for every file it creates, and readlink for every link status FileContext
 * asks for (twice per rename). Spark's streaming queries create three checkpoint
 * files per micro-batch (source log, offsets, commits): 15-18 ms each on a 2-core machine,
 * where a write and a rename take well under a millisecond. Everything else is Hadoop's.
 */
public class NioRawLocalFileSystem extends RawLocalFileSystem {
  private static final PosixFilePermission[] BITS = {
    PosixFilePermission.OTHERS_EXECUTE, PosixFilePermission.OTHERS_WRITE, PosixFilePermission.OTHERS_READ,
    PosixFilePermission.GROUP_EXECUTE, PosixFilePermission.GROUP_WRITE, PosixFilePermission.GROUP_READ,
    PosixFilePermission.OWNER_EXECUTE, PosixFilePermission.OWNER_WRITE, PosixFilePermission.OWNER_READ,
  };

  @Override
  public void setPermission(Path p, FsPermission permission) throws IOException {
    int mode = permission.toShort();
    Set<PosixFilePermission> perms = EnumSet.noneOf(PosixFilePermission.class);
    for (int bit = 0; bit < BITS.length; bit++) {
      if ((mode & (1 << bit)) != 0) {
        perms.add(BITS[bit]);
      }
    }
    Files.setPosixFilePermissions(pathToFile(p).toPath(), perms);
  }

  @Override
  public FileStatus getFileLinkStatus(Path f) throws IOException {
    if (Files.isSymbolicLink(pathToFile(f).toPath())) {
      return super.getFileLinkStatus(f);
    }
    return getFileStatus(f); // not a link: its own status (FileNotFoundException if missing)
  }
}
